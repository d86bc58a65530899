"""Static memory: lifetimes → one arena with every offset fixed at compile time."""
