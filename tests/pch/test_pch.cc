// Compiled only to build tests/pch/test_pch.h, which every test binary reuses.
