"""Operations: the embedded Redis launcher, the demo, benchmarks, and deployment config."""
