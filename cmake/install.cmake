# cmake/install.cmake -- what `cmake --install` puts where, and the Debian
# package built from it by CPack (`tools/package`, or `cpack -G DEB` in a
# build configured with -DCMAKE_INSTALL_PREFIX=/usr).
#
# Layout (prefix /usr):
#   /usr/bin/qtgd                         the daemon and its commands
#   /usr/share/qtg/{lua,sql,templates}    policy scripts, migrations,
#                                         templates (qtgd's root directory:
#                                         QTG_INSTALL_DATADIR in the binary)
#   /usr/share/qtg/ui                     the web console's static files
#   /etc/qtg/qtg.env, signer.env          settings of the daemon and of the
#                                         signer (conffiles)
#   /lib/systemd/system/qtgd.service, qtgd@.service, qtg-signer.service
#   /usr/lib/tmpfiles.d/qtg.conf          /run/qtg, the console's directory
#   /usr/share/doc/qtg/                   the operator's guide, changelog,
#                                         copyright; /usr/share/man/man8/qtgd.8.gz
# The qtg and qtg-signer system users are made by the postinst (packaging/).
#
# Why /lib/systemd/system: Debian 12's lintian requires units there.
# Why the prefix matters: qtgd looks for its root in <prefix>/share/qtg, a
# path compiled in, so the package is built with prefix /usr.

include(GNUInstallDirs)

set(QTG_PKG_DIR ${CMAKE_SOURCE_DIR}/packaging)
set(QTG_GEN_DIR ${CMAKE_BINARY_DIR}/packaging)
file(MAKE_DIRECTORY ${QTG_GEN_DIR})

install(TARGETS qtgd RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

install(DIRECTORY ${CMAKE_SOURCE_DIR}/lua/ DESTINATION ${CMAKE_INSTALL_DATADIR}/qtg/lua
        FILES_MATCHING PATTERN "*.lua")
install(DIRECTORY ${CMAKE_SOURCE_DIR}/sql/ DESTINATION ${CMAKE_INSTALL_DATADIR}/qtg/sql
        FILES_MATCHING PATTERN "*.sql")
install(DIRECTORY ${CMAKE_SOURCE_DIR}/templates/ DESTINATION ${CMAKE_INSTALL_DATADIR}/qtg/templates
        FILES_MATCHING PATTERN "*.json")
# the web console's static files, served by qtgd under /ui/ (qtg.api.ui)
install(DIRECTORY ${CMAKE_SOURCE_DIR}/ui/ DESTINATION ${CMAKE_INSTALL_DATADIR}/qtg/ui
        FILES_MATCHING PATTERN "*.html" PATTERN "*.css" PATTERN "*.js" PATTERN "*.svg")

# shipped 0644 (it holds no secret yet); the postinst makes it 0640 root:qtg
install(FILES ${QTG_PKG_DIR}/qtg.env DESTINATION /etc/qtg
        PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ)
install(FILES ${QTG_PKG_DIR}/signer.env DESTINATION /etc/qtg
        PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ)
install(FILES ${QTG_PKG_DIR}/qtgd.service ${QTG_PKG_DIR}/qtgd@.service ${QTG_PKG_DIR}/qtg-signer.service
        DESTINATION /lib/systemd/system
        PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ)

install(FILES ${QTG_PKG_DIR}/qtg.tmpfiles DESTINATION ${CMAKE_INSTALL_PREFIX}/lib/tmpfiles.d
        RENAME qtg.conf PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ)

# Documentation: the guide and references, a Debian-format changelog and a
# man page, gzipped reproducibly (-n: no name or time stamp) at configure time.
foreach(gz changelog qtgd.8)
  execute_process(COMMAND gzip -9nc ${QTG_PKG_DIR}/${gz}
                  OUTPUT_FILE ${QTG_GEN_DIR}/${gz}.gz RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "cannot gzip packaging/${gz}")
  endif()
endforeach()
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS
             ${QTG_PKG_DIR}/changelog ${QTG_PKG_DIR}/qtgd.8)
install(FILES ${QTG_GEN_DIR}/changelog.gz ${QTG_PKG_DIR}/copyright
        DESTINATION ${CMAKE_INSTALL_DOCDIR})
file(GLOB QTG_DOCS ${CMAKE_SOURCE_DIR}/docs/*.md)
install(FILES ${CMAKE_SOURCE_DIR}/README.md ${QTG_DOCS} DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(FILES ${QTG_GEN_DIR}/qtgd.8.gz DESTINATION ${CMAKE_INSTALL_MANDIR}/man8)
install(FILES ${QTG_PKG_DIR}/qtg-alerts.yml DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples)

# ---- the .deb --------------------------------------------------------------------
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME qtg)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGING_INSTALL_PREFIX ${CMAKE_INSTALL_PREFIX})
set(CPACK_PACKAGE_CONTACT "qtg maintainers <qtg-maintainers@example.org>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "Lua-scriptable orchestration daemon for money movements")
set(CPACK_STRIP_FILES ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION admin)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
# the synopsis is CPACK_PACKAGE_DESCRIPTION_SUMMARY; this is the body
string(CONCAT CPACK_DEBIAN_PACKAGE_DESCRIPTION
  "qtgd runs treasury movements as DAGs of steps: a C host (libuv loop,\n"
  "async libpq, libcurl, OpenSSL, signing) embedding LuaJIT, whose Lua\n"
  "policies hold the workers, executors and state rules.  Several daemons\n"
  "share one PostgreSQL database safely.\n"
  ".\n"
  "This package ships qtgd, its policy scripts, migrations, templates and\n"
  "web console, and systemd units: qtgd.service and qtgd@.service (the\n"
  "daemon), qtg-signer.service (the signer, the only process holding the\n"
  "signer keys).")
# shared libraries from dpkg-shlibdeps; the Lua C modules qtgd loads at run
# time; adduser for the postinst
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "adduser, lua-cjson, lua-filesystem")
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "postgresql")
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
    "${QTG_PKG_DIR}/postinst;${QTG_PKG_DIR}/prerm;${QTG_PKG_DIR}/postrm;${QTG_PKG_DIR}/conffiles")
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
set(CPACK_DEBIAN_COMPRESSION_TYPE xz)
include(CPack)
