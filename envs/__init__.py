"""Gymnasium environments and supervised sequence tasks."""
