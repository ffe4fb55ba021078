"""``gpu-admission simulate``: replay a trace through the placement the install ships."""
