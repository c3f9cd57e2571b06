//! libFuzzer entry for the `request_path` target; the body and its properties are
//! `pluginsync_fuzz::request_path` (fuzz/src/lib.rs).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pluginsync_fuzz::request_path(data));
