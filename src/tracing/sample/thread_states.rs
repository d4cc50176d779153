//! --idle --states: the thread's state the BPF program saw (bpf/sample.h's
//! enum thread_state) as a stack's root frame, with the system call a
//! thread sleeps in named where this table knows it.

use crate::bpf::sample::types::thread_state;

/// The root frame's label, or None without --states.
pub fn label(state: u8, syscall: i32) -> Option<String> {
    let state = thread_state(state as u32);
    Some(match state {
        thread_state::THREAD_RUNNING => "running (GIL held)".into(),
        thread_state::THREAD_RUNNING_NO_GIL => "running (GIL released)".into(),
        thread_state::THREAD_WAITING_FOR_GIL => "waiting for the GIL".into(),
        thread_state::THREAD_RELEASED if syscall < 0 => "released (preempted)".into(),
        thread_state::THREAD_RELEASED => match syscall_name(syscall) {
            Some(name) => format!("released: {name}"),
            None => format!("released: syscall {syscall}"),
        },
        _ => return None,
    })
}

/// x86-64's system calls that a thread can sleep in for long (I/O, waits,
/// sleeps), by number (arch/x86/entry/syscalls/syscall_64.tbl); others are
/// shown by number.
fn syscall_name(nr: i32) -> Option<&'static str> {
    Some(match nr {
        0 => "read",
        1 => "write",
        2 => "open",
        3 => "close",
        4 => "stat",
        5 => "fstat",
        7 => "poll",
        9 => "mmap",
        16 => "ioctl",
        17 => "pread64",
        18 => "pwrite64",
        19 => "readv",
        20 => "writev",
        23 => "select",
        24 => "sched_yield",
        34 => "pause",
        35 => "nanosleep",
        40 => "sendfile",
        42 => "connect",
        43 => "accept",
        44 => "sendto",
        45 => "recvfrom",
        46 => "sendmsg",
        47 => "recvmsg",
        61 => "wait4",
        73 => "flock",
        74 => "fsync",
        75 => "fdatasync",
        128 => "rt_sigtimedwait",
        130 => "rt_sigsuspend",
        202 => "futex",
        208 => "io_getevents",
        217 => "getdents64",
        230 => "clock_nanosleep",
        232 => "epoll_wait",
        247 => "waitid",
        257 => "openat",
        270 => "pselect6",
        271 => "ppoll",
        275 => "splice",
        281 => "epoll_pwait",
        288 => "accept4",
        299 => "recvmmsg",
        307 => "sendmmsg",
        426 => "io_uring_enter",
        441 => "epoll_pwait2",
        449 => "futex_waitv",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_name_known_system_calls_and_number_others() {
        assert_eq!(label(thread_state::THREAD_RELEASED.0 as u8, 23).as_deref(), Some("released: select"));
        assert_eq!(label(thread_state::THREAD_RELEASED.0 as u8, 333).as_deref(), Some("released: syscall 333"));
        assert_eq!(label(thread_state::THREAD_RELEASED.0 as u8, -1).as_deref(), Some("released (preempted)"));
        assert_eq!(label(thread_state::THREAD_WAITING_FOR_GIL.0 as u8, -1).as_deref(), Some("waiting for the GIL"));
        assert_eq!(label(0, -1), None);
    }
}
