"""What a process of the platform runs on: its signals, its Spark session and shipped code, its Redis."""
