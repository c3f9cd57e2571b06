//! libFuzzer entry for the `query` target; the body and its properties are
//! `pluginsync_fuzz::query` (fuzz/src/lib.rs).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pluginsync_fuzz::query(data));
