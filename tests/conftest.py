"""Project-wide pytest configuration: registers the GCS emulator fixtures
(tests/gcs_emulators.py: ``gcs_emulator``, ``fake_gcs``, ``fake_google_auth``)."""

pytest_plugins = ["tests.gcs_emulators"]
