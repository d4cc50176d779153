//! The BPF skeletons built from bpf/*.bpf.c by build.rs, and how they are
//! loaded.

pub mod load;

#[allow(clippy::all, dead_code, non_camel_case_types, unused_imports)]
pub mod calls {
    include!(concat!(env!("CARGO_MANIFEST_DIR"), "/src/bpf/calls.skel.rs"));
}

#[allow(clippy::all, dead_code, non_camel_case_types, unused_imports)]
pub mod gc {
    include!(concat!(env!("CARGO_MANIFEST_DIR"), "/src/bpf/gc.skel.rs"));
}

#[allow(clippy::all, dead_code, non_camel_case_types, unused_imports)]
pub mod imports {
    include!(concat!(env!("CARGO_MANIFEST_DIR"), "/src/bpf/imports.skel.rs"));
}

#[allow(clippy::all, dead_code, non_camel_case_types, unused_imports)]
pub mod sample {
    include!(concat!(env!("CARGO_MANIFEST_DIR"), "/src/bpf/sample.skel.rs"));
}

#[allow(clippy::all, dead_code, non_camel_case_types, unused_imports)]
pub mod gil {
    include!(concat!(env!("CARGO_MANIFEST_DIR"), "/src/bpf/gil.skel.rs"));
}

/// bpf/histogram.bpf.h's bucket functions, run by src/model/latency.rs's tests.
#[cfg(test)]
#[allow(clippy::all, dead_code, non_camel_case_types, unused_imports)]
pub mod histogram_test {
    include!(concat!(env!("CARGO_MANIFEST_DIR"), "/src/bpf/histogram_test.skel.rs"));
}

#[allow(clippy::all, dead_code, non_camel_case_types, unused_imports)]
pub mod memory {
    include!(concat!(env!("CARGO_MANIFEST_DIR"), "/src/bpf/memory.skel.rs"));
}
