"""forgetful: models package."""
