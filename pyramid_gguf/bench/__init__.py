"""Measurement: benchmark prompts, the config grid, runs, aggregation and reports, ``tune``,
HumanEval and charts."""
