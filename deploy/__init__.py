"""How the platform runs: settings, the Spark session, the embedded Redis, the command line."""
