//! libFuzzer entry for the `frames` target; the body and its properties are
//! `pluginsync_fuzz::frames` (fuzz/src/lib.rs).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pluginsync_fuzz::frames(data));
