"""Advantage estimators, policy and value losses, KL terms and DAPO's batch recipe: pure tensor math, registered by
name."""
