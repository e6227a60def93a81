"""The result store: layout, atomic files, claims, manifests, journal and clean-up."""
