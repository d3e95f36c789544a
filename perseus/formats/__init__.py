"""Files: profiles, frontiers and plans on disk."""
