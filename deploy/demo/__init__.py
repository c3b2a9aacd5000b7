"""Demo traffic: sample events of the built-in pipelines, posted to the API at a steady rate."""
