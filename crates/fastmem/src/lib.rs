//! `memcpy`, `memmove`, `memcmp` and `bcmp` for the static musl builds.
//!
//! musl's x86_64 `memcpy` is `rep movsq` with byte moves around it, with no short path; on the
//! build and benchmark machines it takes 20-31 ns for a copy of 1-100 bytes, where glibc's
//! takes under 2 ns (BENCHMARKS.md, "Copies"). Rust calls it for every short copy it cannot
//! unroll (`Vec::extend_from_slice` with a length known only at run time: hyper's headers,
//! string clones, SQLite's cells), some 330 times in a record's Show. musl's `memcmp` (and
//! `bcmp`, which calls it) compares a byte at a time on every architecture (the statement
//! cache compares each statement's SQL text in full). So with musl this crate defines
//! `memcpy` and `memmove` on x86_64 (musl's aarch64 `memcpy` is an optimised one) and
//! `memcmp` and `bcmp` on x86_64 and aarch64, and the static link takes them instead of
//! libc's; other targets keep their libc's, and the functions stay callable under their Rust
//! names for the tests.
//!
//! Copies of up to 32 bytes load everything before they store (two overlapping loads of 16,
//! 8, 4 or 1 bytes), so they are also correct for overlapping buffers; longer ones move 32
//! bytes a step, with the last (or first) 32 bytes loaded before the loop and stored after it.
//! Copies of `REP_MOVSB_MIN_BYTES` or more that do not overlap use `rep movsb` on x86_64,
//! which the processor runs fast at that size. Comparisons go eight bytes (equality sixteen)
//! a step; both architectures load unaligned words natively.
//!
//! `no_builtins` keeps the compiler from turning these loops back into calls to `memcpy`.

#![no_std]
#![no_builtins]

use core::ptr::{read_unaligned, write_unaligned};

/// From this length on, a copy between buffers that do not overlap is one `rep movsb`.
pub const REP_MOVSB_MIN_BYTES: usize = 2048;

type Block = [u128; 2];

/// Copies `n <= 32` bytes; all loads come before any store, so the buffers may overlap.
#[inline(always)]
unsafe fn copy_short(d: *mut u8, s: *const u8, n: usize) {
    unsafe {
        if n >= 16 {
            let a = read_unaligned(s as *const u128);
            let b = read_unaligned(s.add(n - 16) as *const u128);
            write_unaligned(d as *mut u128, a);
            write_unaligned(d.add(n - 16) as *mut u128, b);
        } else if n >= 8 {
            let a = read_unaligned(s as *const u64);
            let b = read_unaligned(s.add(n - 8) as *const u64);
            write_unaligned(d as *mut u64, a);
            write_unaligned(d.add(n - 8) as *mut u64, b);
        } else if n >= 4 {
            let a = read_unaligned(s as *const u32);
            let b = read_unaligned(s.add(n - 4) as *const u32);
            write_unaligned(d as *mut u32, a);
            write_unaligned(d.add(n - 4) as *mut u32, b);
        } else if n > 0 {
            let a = *s;
            let b = *s.add(n / 2);
            let c = *s.add(n - 1);
            *d = a;
            *d.add(n / 2) = b;
            *d.add(n - 1) = c;
        }
    }
}

#[inline(always)]
unsafe fn block(d: *mut u8, s: *const u8, i: usize) {
    unsafe { write_unaligned(d.add(i) as *mut Block, read_unaligned(s.add(i) as *const Block)) }
}

/// `n > 32`, front to back: correct when `d` is before `s` or the buffers do not overlap.
#[inline(always)]
unsafe fn copy_long_forward(d: *mut u8, s: *const u8, n: usize) {
    unsafe {
        let tail = read_unaligned(s.add(n - 32) as *const Block);
        let mut i = 0;
        while i + 32 < n {
            block(d, s, i);
            i += 32;
        }
        write_unaligned(d.add(n - 32) as *mut Block, tail);
    }
}

/// `n > 32`, back to front: correct when `d` is after `s` or the buffers do not overlap.
#[inline(always)]
unsafe fn copy_long_backward(d: *mut u8, s: *const u8, n: usize) {
    unsafe {
        let head = read_unaligned(s as *const Block);
        let mut i = n;
        while i > 32 {
            i -= 32;
            block(d, s, i);
        }
        write_unaligned(d as *mut Block, head);
    }
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn rep_movsb(d: *mut u8, s: *const u8, n: usize) {
    // SAFETY: the caller passes buffers of n bytes that do not overlap; the direction flag is
    // clear, as the ABI requires between calls.
    unsafe {
        core::arch::asm!(
            "rep movsb",
            inout("rcx") n => _,
            inout("rdi") d => _,
            inout("rsi") s => _,
            options(nostack, preserves_flags)
        );
    }
}

#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
unsafe fn rep_movsb(d: *mut u8, s: *const u8, n: usize) {
    unsafe { copy_long_forward(d, s, n) }
}

/// Copies `n` bytes from `s` to `d`, buffers that do not overlap (C's `memcpy`).
///
/// # Safety
/// `s` must be valid for reads and `d` for writes of `n` bytes, and they must not overlap.
#[inline]
pub unsafe fn copy(d: *mut u8, s: *const u8, n: usize) {
    unsafe {
        if n <= 32 {
            copy_short(d, s, n)
        } else if n < REP_MOVSB_MIN_BYTES {
            copy_long_forward(d, s, n)
        } else {
            rep_movsb(d, s, n)
        }
    }
}

/// Copies `n` bytes from `s` to `d`, buffers that may overlap (C's `memmove`).
///
/// # Safety
/// `s` must be valid for reads and `d` for writes of `n` bytes.
#[inline]
pub unsafe fn copy_overlapping(d: *mut u8, s: *const u8, n: usize) {
    unsafe {
        if n <= 32 {
            copy_short(d, s, n)
        } else if (d as usize).wrapping_sub(s as usize) >= n {
            // d is before s, or at least n bytes after it: front to back never reads a byte
            // it has already written.
            if (s as usize).wrapping_sub(d as usize) >= n && n >= REP_MOVSB_MIN_BYTES {
                rep_movsb(d, s, n)
            } else {
                copy_long_forward(d, s, n)
            }
        } else {
            copy_long_backward(d, s, n)
        }
    }
}

/// Compares `n` bytes as unsigned bytes (C's `memcmp`): negative, zero or positive.
///
/// # Safety
/// `a` and `b` must be valid for reads of `n` bytes.
#[inline]
pub unsafe fn compare(a: *const u8, b: *const u8, n: usize) -> i32 {
    unsafe {
        if n < 8 {
            for i in 0..n {
                let (x, y) = (*a.add(i), *b.add(i));
                if x != y {
                    return i32::from(x) - i32::from(y);
                }
            }
            return 0;
        }
        // Eight bytes a step, the last step overlapping the one before (its common bytes are
        // equal by then). Read big-endian, a word orders as its first differing byte does.
        let word = |i: usize| {
            (u64::from_be(read_unaligned(a.add(i) as *const u64)), u64::from_be(read_unaligned(b.add(i) as *const u64)))
        };
        let mut i = 0;
        loop {
            let at = if i + 8 < n { i } else { n - 8 };
            let (x, y) = word(at);
            if x != y {
                return if x < y { -1 } else { 1 };
            }
            if at == n - 8 {
                return 0;
            }
            i += 8;
        }
    }
}

/// Whether `n` bytes are equal (C's `bcmp`: zero when equal).
///
/// # Safety
/// `a` and `b` must be valid for reads of `n` bytes.
#[inline]
pub unsafe fn equal(a: *const u8, b: *const u8, n: usize) -> bool {
    unsafe {
        if n < 16 {
            return compare(a, b, n) == 0;
        }
        let chunk = |i: usize| read_unaligned(a.add(i) as *const u128) == read_unaligned(b.add(i) as *const u128);
        let mut i = 0;
        while i + 16 < n {
            if !chunk(i) {
                return false;
            }
            i += 16;
        }
        chunk(n - 16)
    }
}

#[cfg(all(target_arch = "x86_64", target_env = "musl", feature = "libc-symbols", not(test)))]
mod copy_symbols {
    /// # Safety
    /// As C's `memcpy`.
    #[unsafe(no_mangle)]
    pub unsafe extern "C" fn memcpy(d: *mut u8, s: *const u8, n: usize) -> *mut u8 {
        unsafe { super::copy(d, s, n) };
        d
    }

    /// # Safety
    /// As C's `memmove`.
    #[unsafe(no_mangle)]
    pub unsafe extern "C" fn memmove(d: *mut u8, s: *const u8, n: usize) -> *mut u8 {
        unsafe { super::copy_overlapping(d, s, n) };
        d
    }
}

#[cfg(all(
    any(target_arch = "x86_64", target_arch = "aarch64"),
    target_env = "musl",
    feature = "libc-symbols",
    not(test)
))]
mod compare_symbols {
    /// # Safety
    /// As C's `memcmp`.
    #[unsafe(no_mangle)]
    pub unsafe extern "C" fn memcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
        unsafe { super::compare(a, b, n) }
    }

    /// # Safety
    /// As C's `bcmp`.
    #[unsafe(no_mangle)]
    pub unsafe extern "C" fn bcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
        i32::from(!unsafe { super::equal(a, b, n) })
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::vec::Vec;

    const LENGTHS: &[usize] = &[
        0, 1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 47, 63, 64, 65, 95, 96, 97, 127, 128, 129, 255, 256, 257,
        1000, 1023, 2047, 2048, 2049, 4096, 5000,
    ];

    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 131 + 7) as u8).collect()
    }

    #[test]
    fn copy_matches_a_byte_loop_at_every_length_and_alignment() {
        let src = pattern(6000);
        for n in (0..=300).chain(LENGTHS.iter().copied()) {
            for so in 0..16 {
                for dof in 0..16 {
                    let mut dst = std::vec![0xAAu8; 6000 + 64];
                    unsafe { super::copy(dst.as_mut_ptr().add(dof + 16), src.as_ptr().add(so), n) };
                    assert!(dst[..dof + 16].iter().all(|&b| b == 0xAA), "wrote before: n {n} so {so} do {dof}");
                    assert_eq!(&dst[dof + 16..dof + 16 + n], &src[so..so + n], "n {n} so {so} do {dof}");
                    assert!(dst[dof + 16 + n..].iter().all(|&b| b == 0xAA), "wrote after: n {n} so {so} do {dof}");
                }
            }
        }
    }

    #[test]
    fn compare_and_equal_agree_with_slice_ordering() {
        let a = pattern(600);
        for n in (0..=300).chain([511, 512, 513, 600]) {
            for off in 0..8 {
                let x = &a[off..off + n.min(600 - off)];
                let n = x.len();
                let same = x.to_vec();
                assert_eq!(unsafe { super::compare(x.as_ptr(), same.as_ptr(), n) }, 0, "n {n}");
                assert!(unsafe { super::equal(x.as_ptr(), same.as_ptr(), n) }, "n {n}");
                // One byte differs, at each position, both ways round, by a little and by a lot.
                for at in 0..n {
                    for delta in [1u8, 0x80] {
                        let mut y = same.clone();
                        y[at] = y[at].wrapping_add(delta);
                        let want = x.cmp(&y[..]) as i32;
                        let got = unsafe { super::compare(x.as_ptr(), y.as_ptr(), n) }.signum();
                        assert_eq!(got, want, "n {n} at {at} delta {delta}");
                        let got = unsafe { super::compare(y.as_ptr(), x.as_ptr(), n) }.signum();
                        assert_eq!(got, -want, "n {n} at {at} delta {delta}, swapped");
                        assert!(!unsafe { super::equal(x.as_ptr(), y.as_ptr(), n) }, "n {n} at {at}");
                        // A later difference does not outweigh an earlier one.
                        if at + 1 < n {
                            y[n - 1] = y[n - 1].wrapping_sub(delta);
                            let got = unsafe { super::compare(x.as_ptr(), y.as_ptr(), n) }.signum();
                            assert_eq!(got, x.cmp(&y[..]) as i32, "n {n} at {at} and last");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn copy_overlapping_matches_a_copy_through_a_temporary() {
        for n in (0..=200).chain(LENGTHS.iter().copied()) {
            for delta in (-70isize..=70).chain([-2049, -1000, 1000, 2049, 5000, -5000]) {
                // The source at `base`, the destination `delta` bytes from it, both inside.
                let base = 5100usize;
                let s = base;
                let d = (base as isize + delta) as usize;
                let mut buf = pattern(base + 5100 + n);
                let mut want = buf.clone();
                let tmp: Vec<u8> = want[s..s + n].to_vec();
                want[d..d + n].copy_from_slice(&tmp);
                unsafe { super::copy_overlapping(buf.as_mut_ptr().add(d), buf.as_ptr().add(s), n) };
                assert!(buf == want, "n {n} delta {delta}");
            }
        }
    }
}
