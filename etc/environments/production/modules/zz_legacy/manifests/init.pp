class zz_legacy { }
