"""The decoding core: sampling and acceptance math (pure numpy), the proposer / verifier
protocol, model tiers, proposers, and the engine that runs every mode."""
