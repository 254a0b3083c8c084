"""Start cells of the corridor's tasks (a task dict is passed to corridor.reset)."""
TASKS = [{"start": 0}, {"start": 2}]
