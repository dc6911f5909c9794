"""The gateway's endpoint pickers (Gateway API Inference Extension, llm-d-router)."""
