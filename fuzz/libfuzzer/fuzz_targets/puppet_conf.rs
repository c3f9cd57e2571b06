//! libFuzzer entry for the `puppet_conf` target; the body and its properties are
//! `pluginsync_fuzz::puppet_conf` (fuzz/src/lib.rs).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pluginsync_fuzz::puppet_conf(data));
