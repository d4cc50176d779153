/* The function the probe-site table calls through the PLT, written in
 * assembly so that its instructions are known: endbr64 (single-stepped),
 * then push (emulated), then an add to memory (single-stepped). */
__asm__(
    ".text\n"
    ".globl bump\n"
    ".type bump, @function\n"
    "bump:\n"
    "    endbr64\n"
    "    push %rbx\n"
    "    addl $1, (%rdi)\n"
    "    pop %rbx\n"
    "    ret\n"
    ".size bump, .-bump\n");
