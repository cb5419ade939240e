"""What the series is shipped as: the patched wheel (the image is the Dockerfile)."""
