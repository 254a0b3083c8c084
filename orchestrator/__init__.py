"""autorl: an overnight autoresearch daemon for reinforcement learning."""
