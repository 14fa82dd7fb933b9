"""What the benchmarks share; the tests may import it too (the prompt-cache model, the PostgreSQL
server), and it imports nothing of the tests."""
