"""Identity rules as pure functions: process -> Pod (cgroup), container ordinal -> host GPU.

Nothing here does I/O; sources read the files, these functions interpret the text.
"""
