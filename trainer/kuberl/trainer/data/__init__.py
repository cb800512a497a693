"""Prompt data: rows in verl's schema from local or remote files, the resumable loader, generated tasks and length
statistics."""
