"""Opt-in tests against real, heavy components (see README.md here); not run by CI."""
