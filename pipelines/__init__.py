"""forgetful: pipelines package."""
