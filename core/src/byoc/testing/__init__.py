"""Testing utilities and the vendor conformance kit."""
