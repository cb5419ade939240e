"""The pure engine: patch files, anchors, the analysis of a series on file contents in
memory, and the pure records (pin, version file, RECORD lines, the applied-patches
state). No disk, git or pip here."""
