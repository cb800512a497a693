"""Ray actors of the trainer ranks (SPMD inside a group, driven by the single controller) and their groups."""
