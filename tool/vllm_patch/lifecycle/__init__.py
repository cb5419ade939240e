"""The series' lifecycle: upstream trees, rebase, outlook, obsolete checks, authoring."""
