"""The storage sandbox: a real Ceph cluster (mon, mgr, OSDs on BlueStore, radosgw) from Debian's
packages, realised from a stack's storage section (docs/storage.md)."""
