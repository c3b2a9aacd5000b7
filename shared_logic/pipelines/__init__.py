"""Built-in pipelines, written exactly as a user writes theirs (see shared_logic.pipeline)."""
