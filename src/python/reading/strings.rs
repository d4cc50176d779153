//! Decodes str objects whose bytes a BPF program copied out of the target.
//! BPF only copies (bounded); decoding, and refusing garbage, happen here.

// bpf/python.h's enum str_kind, as the skeleton carries it: calls and imports
// both include python.h, so either skeleton's copy is the C one.
use crate::bpf::calls::types::str_kind;

/// `kind` is how the bytes were captured: an enum str_kind value, as the
/// records carry it (a __u8).
pub fn decode(kind: u8, len_chars: u32, bytes: &[u8]) -> Option<String> {
    let (width, latin1) = match str_kind(kind.into()) {
        str_kind::STR_UTF8 => {
            let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
            return std::str::from_utf8(&bytes[..end]).ok().map(str::to_string);
        }
        str_kind::STR_ASCII => (1, false),
        str_kind::STR_UCS1 => (1, true),
        str_kind::STR_UCS2 => (2, false),
        str_kind::STR_UCS4 => (4, false),
        _ => return None,
    };
    let captured = (bytes.len() / width).min(len_chars as usize);
    let mut out = String::with_capacity(captured);
    for chunk in bytes[..captured * width].chunks_exact(width) {
        let code = match width {
            1 => chunk[0] as u32,
            2 => u16::from_le_bytes([chunk[0], chunk[1]]) as u32,
            _ => u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]),
        };
        // An ASCII str with a byte above 127, or a control character, means
        // the object was freed or is not a str: not a name to print.
        if (!latin1 && width == 1 && code > 127) || code < 0x20 {
            return None;
        }
        out.push(char::from_u32(code)?);
    }
    if captured < len_chars as usize {
        out.push('…');
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The wire value of a kind, as a BPF record carries it.
    fn k(kind: str_kind) -> u8 {
        kind.0 as u8
    }

    #[test]
    fn decodes_each_kind() {
        assert_eq!(decode(k(str_kind::STR_UTF8), 3, b"f\xc3\xa9\0junk").as_deref(), Some("fé"));
        assert_eq!(decode(k(str_kind::STR_ASCII), 4, b"main").as_deref(), Some("main"));
        assert_eq!(decode(k(str_kind::STR_UCS1), 2, &[0x63, 0xe9]).as_deref(), Some("cé"));
        assert_eq!(decode(k(str_kind::STR_UCS2), 1, &0x3bbu16.to_le_bytes()).as_deref(), Some("λ"));
        assert_eq!(decode(k(str_kind::STR_UCS4), 1, &0x1f600u32.to_le_bytes()).as_deref(), Some("😀"));
    }

    #[test]
    fn marks_truncation_and_refuses_garbage() {
        assert_eq!(decode(k(str_kind::STR_ASCII), 10, b"abc").as_deref(), Some("abc…"));
        assert_eq!(decode(k(str_kind::STR_ASCII), 2, &[b'a', 0xff]), None);
        assert_eq!(decode(k(str_kind::STR_ASCII), 2, b"a\x01"), None);
        assert_eq!(decode(k(str_kind::STR_UNREADABLE), 3, b"abc"), None);
        assert_eq!(decode(k(str_kind::STR_UCS4), 1, &0xd800u32.to_le_bytes()), None, "a surrogate is no char");
    }
}
