//! libFuzzer entry for the `ignore` target; the body and its properties are
//! `pluginsync_fuzz::ignore` (fuzz/src/lib.rs).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pluginsync_fuzz::ignore(data));
