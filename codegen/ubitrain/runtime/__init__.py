"""Building the generated C project and driving it from Python."""
