# make, make install, make uninstall: the conventional front of Packaging/install.sh, which does
# the work (one implementation of the install, tested by the suite's ServiceTests).
#
#   make install                          build (release) and install under /usr/local, the
#                                         system unit in /etc/systemd/system, /var/lib/bgtask
#   make install PREFIX=/opt/bgtask       another prefix (the unit's ExecStart= follows it)
#   make install DESTDIR=/tmp/stage       stage every file under /tmp/stage (for a package);
#                                         systemd is left alone
#   make install USER_UNIT=1              the user unit and ~/.local (PREFIX default ~/.local)
#   make install NO_BUILD=1 BUILD_DIR=d   install what d holds instead of building
#   make install NO_STRIP=1               install the binaries unstripped (by default they are
#                                         stripped; the build directory keeps them whole)
#   make uninstall [same variables]       remove it all again, except the state directory
#
# Then: systemctl enable --now bgtask; logs: journalctl -u bgtask (docs/install.md).

PREFIX ?=
DESTDIR ?=
USER_UNIT ?=
NO_BUILD ?=
BUILD_DIR ?=
NO_STRIP ?=

INSTALL_ARGS = $(if $(PREFIX),--prefix '$(PREFIX)') $(if $(DESTDIR),--destdir '$(DESTDIR)') \
	$(if $(filter 1 yes true,$(USER_UNIT)),--user) $(if $(filter 1 yes true,$(NO_BUILD)),--no-build) \
	$(if $(BUILD_DIR),--build-dir '$(BUILD_DIR)') $(if $(filter 1 yes true,$(NO_STRIP)),--no-strip)

.PHONY: all install uninstall install-print

all:
	swift build -c release --product bgtask
	swift build -c release --product bgtask-runner
	swift build -c release --product generate-manual

install:
	bash Packaging/install.sh $(INSTALL_ARGS)

uninstall:
	bash Packaging/install.sh --uninstall $(INSTALL_ARGS)

# What install would do, as commands, without doing any of it.
install-print:
	bash Packaging/install.sh --print $(INSTALL_ARGS)
