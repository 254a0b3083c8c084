"""Agent kinds, one file each; see base.py for the interface."""
