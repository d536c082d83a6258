//! Times the libc's `memcpy` and `bcmp` (as the binary links them) against this crate's
//! functions, for short and long buffers. On x86_64 musl with the default features the
//! "libc" columns are this crate's own symbols; with `--no-default-features` they are musl's:
//!
//!     cargo run --release -p fastmem --example copies --target x86_64-unknown-linux-musl [--no-default-features]
//!     cargo run --release -p fastmem --example copies                  (glibc, for comparison)

use std::hint::black_box;
use std::time::Instant;

const LENGTHS: &[usize] = &[1, 3, 8, 17, 40, 100, 300, 600, 1500, 4096];

fn time(iters: usize, mut f: impl FnMut(usize)) -> f64 {
    let started = Instant::now();
    for i in 0..iters {
        f(i);
    }
    started.elapsed().as_nanos() as f64 / iters as f64
}

fn main() {
    let src: Vec<u8> = (0..8192u32).map(|i| i as u8).collect();
    let mut dst = vec![0u8; 8192];
    let same = src.clone();
    println!("| bytes | libc memcpy ns | fastmem copy ns | libc bcmp ns (equal buffers) | fastmem equal ns |");
    println!("|---|---|---|---|---|");
    for &n in LENGTHS {
        let iters = 20_000_000 / (1 + n / 64);
        let libc_copy = time(iters, |i| {
            let off = i & 63;
            // Through `copy_from_slice`, as Rust code reaches memcpy: a call with the length
            // known only at run time.
            dst[off..off + black_box(n)].copy_from_slice(&src[off..off + n]);
            black_box(&mut dst);
        });
        let ours_copy = time(iters, |i| {
            let off = i & 63;
            unsafe { fastmem::copy(dst.as_mut_ptr().add(off), src.as_ptr().add(off), black_box(n)) };
            black_box(&mut dst);
        });
        let libc_cmp = time(iters, |i| {
            let off = i & 63;
            black_box(src[off..off + black_box(n)] == same[off..off + n]);
        });
        let ours_cmp = time(iters, |i| {
            let off = i & 63;
            black_box(unsafe { fastmem::equal(src.as_ptr().add(off), same.as_ptr().add(off), black_box(n)) });
        });
        println!("| {n} | {libc_copy:.1} | {ours_copy:.1} | {libc_cmp:.1} | {ours_cmp:.1} |");
    }
}
