//! Finds where a function returns, by decoding its machine code.

use iced_x86::{Decoder, DecoderOptions, FlowControl};

/// Addresses of the `ret` instructions in `code`, which starts at `address`.
/// Compilers keep no data inside a function's symbol range, so a linear
/// decode from its start sees every instruction.
pub fn return_sites(code: &[u8], address: u64) -> Vec<u64> {
    let mut decoder = Decoder::with_ip(64, code, address, DecoderOptions::NONE);
    let mut sites = Vec::new();
    while decoder.can_decode() {
        let instruction = decoder.decode();
        if instruction.flow_control() == FlowControl::Return {
            sites.push(instruction.ip());
        }
    }
    sites
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_every_ret_and_only_rets() {
        // push rbp; mov eax, 0xc3 (a 0xc3 byte that is not a ret); je +1;
        // ret; pop rbp; ret
        let code = [0x55, 0xb8, 0xc3, 0x00, 0x00, 0x00, 0x74, 0x01, 0xc3, 0x5d, 0xc3];
        assert_eq!(return_sites(&code, 0x1000), vec![0x1008, 0x100a]);
    }
}
