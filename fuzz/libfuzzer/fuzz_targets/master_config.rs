//! libFuzzer entry for the `master_config` target; the body and its properties are
//! `pluginsync_fuzz::master_config` (fuzz/src/lib.rs).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pluginsync_fuzz::master_config(data));
