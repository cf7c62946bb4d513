// Finding and calling a method that no protocol declares (issue 30): iOS calls
// `urlSessionDidFinishEvents(forBackgroundURLSession:)` on a background session's delegate when
// the delegate implements it, asking the Objective-C runtime (`respondsToSelector:`). Apple's
// `URLSessionDelegate` declares it; swift-corelibs-foundation's does not, and Swift has no way
// to call a method by name. The method is still there: a Swift method of a class is a function
// symbol, exported from the plugin's image (internal declarations too, in a shared library).
// `bgtask_object_symbols` lists the function symbols of the image holding an address (the
// class's metadata) whose names start with a prefix (the class's mangled name); Swift demangles
// them to find the method's exact signature; `bgtask_call_swift_method1` calls it with Swift's
// convention (clang's swiftcall, `self` in the context register).
//
// The image is read from its file (its dynamic symbol table), with every offset checked
// against the file's size: a plugin's file is the app's own, but a truncated or odd one gives no
// symbol rather than a crash.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "bgtask_urlsession_hook.h"

#define SWIFTCALL __attribute__((swiftcall))
#define SWIFT_CONTEXT __attribute__((swift_context))

static int within(size_t offset, size_t length, size_t size) {
    return offset <= size && length <= size - offset;
}

int bgtask_object_symbols(const void *address_in_object, const char *prefix,
                          int (*visit)(const char *name, void *address, void *context), void *context) {
    Dl_info info;
    if (!address_in_object || !prefix || !visit || !dladdr(address_in_object, &info) || !info.dli_fname || !info.dli_fbase)
        return -1;
    int fd = open(info.dli_fname, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    struct stat status;
    if (fstat(fd, &status) != 0 || status.st_size < (off_t)sizeof(Elf64_Ehdr)) { close(fd); return -1; }
    size_t size = (size_t)status.st_size;
    const unsigned char *file = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (file == MAP_FAILED) return -1;
    int found = -1;
    const Elf64_Ehdr *header = (const Elf64_Ehdr *)file;
    if (memcmp(header->e_ident, ELFMAG, SELFMAG) != 0 || header->e_ident[EI_CLASS] != ELFCLASS64 ||
        header->e_shentsize != sizeof(Elf64_Shdr) ||
        !within(header->e_shoff, (size_t)header->e_shnum * sizeof(Elf64_Shdr), size))
        goto done;
    const Elf64_Shdr *sections = (const Elf64_Shdr *)(file + header->e_shoff);
    // A shared object's symbol values are offsets from where it was loaded; an executable's
    // are addresses.
    uintptr_t base = header->e_type == ET_DYN ? (uintptr_t)info.dli_fbase : 0;
    size_t prefix_length = strlen(prefix);
    found = 0;
    for (size_t s = 0; s < header->e_shnum; s++) {
        const Elf64_Shdr *symbols = &sections[s];
        if (symbols->sh_type != SHT_DYNSYM || symbols->sh_entsize != sizeof(Elf64_Sym) || symbols->sh_link >= header->e_shnum)
            continue;
        const Elf64_Shdr *strings = &sections[symbols->sh_link];
        if (!within(symbols->sh_offset, symbols->sh_size, size) || !within(strings->sh_offset, strings->sh_size, size))
            continue;
        const char *names = (const char *)(file + strings->sh_offset);
        size_t count = symbols->sh_size / sizeof(Elf64_Sym);
        for (size_t i = 0; i < count; i++) {
            const Elf64_Sym *symbol = (const Elf64_Sym *)(file + symbols->sh_offset) + i;
            if (ELF64_ST_TYPE(symbol->st_info) != STT_FUNC || symbol->st_shndx == SHN_UNDEF || symbol->st_value == 0)
                continue;
            if (symbol->st_name >= strings->sh_size) continue;
            const char *name = names + symbol->st_name;
            size_t room = strings->sh_size - symbol->st_name;
            if (strnlen(name, room) == room || strncmp(name, prefix, prefix_length) != 0) continue;
            found++;
            if (visit(name, (void *)(base + symbol->st_value), context)) goto done;
        }
    }
done:
    munmap((void *)file, size);
    return found;
}

typedef void Method1(void *argument, void *self SWIFT_CONTEXT) SWIFTCALL;

void bgtask_call_swift_method1(void *function, void *argument, void *self) {
    ((Method1 *)function)(argument, self);
}
