"""Reward nets and the preparation of their inputs."""
