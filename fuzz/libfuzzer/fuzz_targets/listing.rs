//! libFuzzer entry for the `listing` target; the body and its properties are
//! `pluginsync_fuzz::listing` (fuzz/src/lib.rs).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pluginsync_fuzz::listing(data));
