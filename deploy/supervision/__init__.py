"""Running the platform as processes: `up`'s tree of supervised children, one thread per pipeline, code changes."""
