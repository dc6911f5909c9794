"""Sources: one module per system. Each returns a frozen snapshot and never raises."""
