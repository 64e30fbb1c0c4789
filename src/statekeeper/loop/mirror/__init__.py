"""A second tier: committed steps copied in the background to a mirror (object storage or
another file system), and resumes that read both tiers."""
