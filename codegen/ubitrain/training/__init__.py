"""The training graph: loss appended, gradients taken, optimizer updates defined."""
