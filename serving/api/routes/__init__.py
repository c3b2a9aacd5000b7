"""HTTP routes of the serving API, one module per resource."""
