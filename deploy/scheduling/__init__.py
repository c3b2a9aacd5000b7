"""When the batch layer recomputes (schedules, on request, single-flight) and the master's upkeep between runs."""
