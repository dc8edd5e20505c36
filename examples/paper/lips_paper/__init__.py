"""The LIPS paper's experimental setup as a Flower App."""
