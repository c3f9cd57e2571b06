//! libFuzzer entry for the `relpath` target; the body and its properties are
//! `pluginsync_fuzz::relpath` (fuzz/src/lib.rs).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pluginsync_fuzz::relpath(data));
