//! Bytes that are no llama.cpp state at all are reported as such, not as a truncated one.

use kvfast_core::{walk, Error, WalkOptions};

fn message(bytes: &[u8]) -> String {
    walk(bytes, WalkOptions::default())
        .expect_err("not a state")
        .to_string()
}

#[test]
fn text_is_not_a_state() {
    for text in [
        &b"hello\n"[..],
        b"hello, this is not a KV cache\n",
        b"{\"id\": 1}\n",
    ] {
        let e = walk(text, WalkOptions::default()).expect_err("text");
        assert!(matches!(e, Error::Format { .. }), "{e}");
        assert_eq!(e.offset(), Some(0));
        let m = e.to_string();
        assert!(m.contains("not a llama.cpp state"), "{m}");
        assert!(m.contains(&format!("{} bytes", text.len())), "{m}");
    }
    assert!(message(b"hello\n").contains("(\"hello.\")"));
}

#[test]
fn short_or_plausible_bytes_keep_their_own_error() {
    // too short for the first word, or a first word some reading accepts: truncated as before
    for bytes in [&b""[..], b"\x00\x00\x00", &[0u8; 7], &[7, 0, 0, 0, 1, 0]] {
        let e = walk(bytes, WalkOptions::default()).expect_err("short");
        assert!(matches!(e, Error::Truncated { .. }), "{bytes:?}: {e}");
    }
    // a count of 300 cells that would fit: a reading is tried and fails on its own terms
    let mut b = 300u32.to_le_bytes().to_vec();
    b.extend([0u8; 2400]);
    assert!(!message(&b).contains("not a llama.cpp state"));
}
