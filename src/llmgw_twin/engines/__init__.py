"""Engine adapters: the argv for rank k of n, which rank serves HTTP, its health path."""
